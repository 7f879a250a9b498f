"""What both programs import, the router and the lane worker: the contract between them, SSE,
the error core, the request field rules and the system-message fold. Nothing here imports
either program."""

"""Cooldown after repeated failures (LiteLLM's allowed_fails / cooldown_time): pure."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Cooldown:
    allowed_fails: int
    seconds: float
    consecutive_fails: int = 0
    until: float = 0.0

    def failure(self, now: float) -> bool:
        """Record a failure; True when this failure starts a cooldown."""
        self.consecutive_fails += 1
        if self.consecutive_fails >= self.allowed_fails and not self.active(now):
            self.until = now + self.seconds
            self.consecutive_fails = 0
            return True
        return False

    def success(self) -> None:
        self.consecutive_fails = 0
        self.until = 0.0

    def active(self, now: float) -> bool:
        return now < self.until

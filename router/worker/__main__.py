from router.worker.main import main

raise SystemExit(main())

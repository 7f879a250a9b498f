from router.cli.main import main

raise SystemExit(main())

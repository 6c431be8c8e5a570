from b70bench.cli import main

raise SystemExit(main())

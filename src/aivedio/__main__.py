from aivedio.cli.main import main

raise SystemExit(main())

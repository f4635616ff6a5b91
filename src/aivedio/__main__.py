from aivedio.cli import main

raise SystemExit(main())

from lowband.cli import main

raise SystemExit(main())

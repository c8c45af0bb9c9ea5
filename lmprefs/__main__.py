from lmprefs.cli.dispatch import main

raise SystemExit(main())

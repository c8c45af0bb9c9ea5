from lmprefs.cli import main

raise SystemExit(main())

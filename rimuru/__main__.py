from rimuru.cli import main

raise SystemExit(main())

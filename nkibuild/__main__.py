from nkibuild.cli.main import main

raise SystemExit(main())

from devkit.demo.main import main

raise SystemExit(main())

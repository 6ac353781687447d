from fastdpr.cli import main

raise SystemExit(main())

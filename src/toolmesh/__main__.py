from toolmesh.cli import main

raise SystemExit(main())

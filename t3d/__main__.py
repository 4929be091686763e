import sys

from t3d.cli import main

sys.exit(main())

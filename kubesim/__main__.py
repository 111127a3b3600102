import sys

from kubesim.cli import main

sys.exit(main())

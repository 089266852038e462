import sys

from icecrypt.cli import main

sys.exit(main())

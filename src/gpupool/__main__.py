import sys

from gpupool.cli import main

sys.exit(main())

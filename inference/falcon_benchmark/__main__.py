import sys

from inference.falcon_benchmark.cli import main

sys.exit(main())

import sys

from inference.llm.falcon_benchmark.cli import main

sys.exit(main())

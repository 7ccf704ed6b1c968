import sys

from inference.llm.lmi.cli import main

sys.exit(main())

import sys

from onnxcast.cli import main

sys.exit(main())

"""``python -m actors.serving CONFIG.yaml``: :mod:`actors.serving.launch`."""
import sys

from actors.serving.launch import main

sys.exit(main())

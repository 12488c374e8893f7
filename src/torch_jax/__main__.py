"""``python -m torch_jax doctor|scan|rerun|evidence``: the ``torch-jax`` command."""

import sys

from torch_jax.doctor._cli import main

sys.exit(main())

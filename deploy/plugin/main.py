"""Entry point of hubproxy-plugin: hubproxy-creds frozen into one static executable.

PyInstaller starts here (hubproxy-plugin.spec); everything the plugin does is
:func:`gateway.access.creds.main`.
"""

import sys

from gateway.access.creds import main

sys.exit(main())

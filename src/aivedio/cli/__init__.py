"""The ``aivedio`` command: ``main.py`` parses and dispatches, one module per command family."""

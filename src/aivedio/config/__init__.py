"""Configuration: ``load.py`` decodes TOML and the environment into frozen structs, validates
and masks them; one module per section."""

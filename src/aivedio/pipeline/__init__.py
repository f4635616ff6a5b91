"""Pipeline stages, one module each, registered as job kinds."""

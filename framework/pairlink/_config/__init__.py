"""What a deployment sets: every bound of a listener's connections (``Limits``) and the TOML
files of ``serve --config`` and ``gateway --config``, each mistake named by file, line and key."""

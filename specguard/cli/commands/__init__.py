"""One module per ``specguard`` subcommand; each has ``register(subparsers)``.

``register`` adds its parser and sets ``func=run`` where ``run(args) -> int`` is the exit code.
"""

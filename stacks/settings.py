"""`python -m stacks.settings`: the settings CLI under the name issue 20 gave it (the models live in settings/)."""

if __name__ == "__main__":
    import sys

    from settings.cli import main

    sys.exit(main())

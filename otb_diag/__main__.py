"""`python -m otb_diag …` runs the same app as the `otb-diag` console script."""

from otb_diag.cli.main import main

if __name__ == "__main__":
    main()

"""Studies that produce the README's figures (``python -m ringcomp.experiments NAME``)."""

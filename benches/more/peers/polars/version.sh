python -c "import polars; print('polars', polars.__version__)"

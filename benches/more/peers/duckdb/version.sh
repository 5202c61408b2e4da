python -c "import duckdb; print('duckdb', duckdb.__version__)"

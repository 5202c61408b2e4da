python -c "import duckdb; print('duckdb', duckdb.__version__, 'bulk COPY')"

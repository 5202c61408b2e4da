python -c "import pyarrow; print('pyarrow', pyarrow.__version__)"

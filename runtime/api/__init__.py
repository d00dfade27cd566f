"""The API process's state behind the HTTP routes: the TokenizerManager and the metrics."""

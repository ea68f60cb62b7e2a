"""A trained model behind HTTP (serve.py): the server's processes, one or more per device (``server``),
the HTTP API (``http_api``), requests batched across clients (``batching``), and what a request may hold
besides an image (``arrays``: an ``.npy`` array).
"""

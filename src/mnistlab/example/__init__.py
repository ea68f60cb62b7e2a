"""The MNIST example's own uses of a trained model: digit images of any size prepared as MNIST's were
(``digits``: predict.py's reader, serve.py's ``decode=digits``), ``predict.py``'s classification of image
files (``prediction``), and ``demo.py``'s page to draw a digit on (``demo``).

What is in a folder named ``example/`` belongs to the example, as does a file whose first line says it is
"Part of the MNIST example": a project generated without the example has none of them (the generator
finds them by these two signs). It may import ``runtime/`` and ``trained/``.
"""

"""A stand-in for the ``horovod`` package, only for Horovod's own tests in tests/hvd/upstream.

Every API name resolves to ringlet's (``horovod.torch`` is ``ringlet.hvd.torch``,
``horovod.tensorflow`` is ``ringlet.hvd.tensorflow``, ``horovod.tensorflow.keras`` is
``ringlet.hvd.tensorflow.keras``, ``horovod.keras`` is ``ringlet.hvd.keras``). The only code
here is glue for Horovod-internal helpers that the test files import (their launcher's
environment reader, a thread starter, a version comparison, TensorFlow's eager check): nothing
a user script would call.
"""

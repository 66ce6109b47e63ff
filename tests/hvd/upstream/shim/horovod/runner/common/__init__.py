"""Only what Horovod's TensorFlow tests import from horovod.runner.common."""

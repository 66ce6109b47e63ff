"""``horovod.common``: only the modules Horovod's TensorFlow tests import."""

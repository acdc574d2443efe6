"""largebatch: large-batch ImageNet training (Goyal 2017, Jia 2018, Ying 2018, Wongpanich 2020)."""

__version__ = "0.2.0"

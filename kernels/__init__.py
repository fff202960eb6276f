"""rimuru.kernels"""

"""rimuru.controlplane"""

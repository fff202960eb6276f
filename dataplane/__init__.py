"""rimuru.dataplane"""

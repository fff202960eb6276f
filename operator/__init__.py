"""rimuru.operator"""

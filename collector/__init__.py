"""collector"""

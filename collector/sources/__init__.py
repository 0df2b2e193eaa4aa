"""collector/sources"""

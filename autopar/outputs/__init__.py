"""Floor 5: what autopar writes for people and programs.

``report`` (tables and text), ``schema`` (the JSON contract), ``emit`` (launch configurations for
Megatron-LM, Megatron-Bridge, torchtitan and DeepSpeed).
"""

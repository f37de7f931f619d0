import numpy as np, torch
f32=np.float32
def amx_dot(A,B,chunks):
    """A,B [n,K] (torch bf16, paired rows). K even. chunks: list of pair counts per TDPBF16PS, sum = K/2.
    Returns fp32 numpy [n]."""
    A=A.double().numpy(); B=B.double().numpy()
    P=(A*B).astype(f32)  # exact products (bf16*bf16 fits fp32) except DAZ/FTZ edge cases
    n,K=P.shape; assert sum(chunks)*2==K, (sum(chunks),K)
    c=np.zeros(n,f32); k=0
    for ch in chunks:
        e=np.zeros(n,f32); o=np.zeros(n,f32)
        for _ in range(ch):
            e=(e+P[:,k]).astype(f32); o=(o+P[:,k+1]).astype(f32); k+=2
        c=(c+(e+o).astype(f32)).astype(f32)
    return c
def chunks_of(npairs, size=16):
    return [size]*(npairs//size)+([npairs%size] if npairs%size else [])

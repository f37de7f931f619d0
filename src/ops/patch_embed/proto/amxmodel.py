"""Finds what one TDPBF16PS computes, in fp32, by running it (amxprobe.c) against candidate models.
Result on this machine (Sapphire Rapids class): per instruction, even-index products and odd-index
products are summed in two separate fp32 chains from 0, then dst + (even + odd): model 'eo:c+(e+o)'."""
import ctypes, os, subprocess, numpy as np, torch
_here=os.path.dirname(os.path.abspath(__file__))
subprocess.check_call(["gcc","-O2","-mamx-tile","-mamx-bf16","-shared","-fPIC",os.path.join(_here,"amxprobe.c"),"-o","/tmp/opgym_amxprobe.so"])
lib=ctypes.CDLL('/tmp/opgym_amxprobe.so'); assert lib.amx_init()==0
def amx(a,b,c):
    # a [16,K] bf16 torch, b [K,16] bf16 torch, c [16,16] float32 numpy
    K=a.shape[1]; kp=K//2
    A=np.ascontiguousarray(a.view(torch.int16).numpy())
    Bv=np.ascontiguousarray(b.view(torch.int16).numpy().reshape(kp,2,16).transpose(0,2,1))
    C=np.ascontiguousarray(c.copy())
    lib.amx_dp(ctypes.c_void_p(A.ctypes.data), ctypes.c_void_p(Bv.ctypes.data), ctypes.c_void_p(C.ctypes.data), kp)
    return C
f32=np.float32
def models(a,b,c):
    A=a.double().numpy(); B=b.double().numpy(); K=A.shape[1]
    P=(A[:,None,:]*B.T[None,:,:])  # [16,16,K] exact
    out={}
    acc=c.copy()
    for k in range(K): acc=(acc+P[...,k].astype(f32)).astype(f32)
    out['seq']=acc
    e=np.zeros_like(c); o=np.zeros_like(c)
    for k in range(0,K,2):
        e=(e+P[...,k].astype(f32)).astype(f32); o=(o+P[...,k+1].astype(f32)).astype(f32)
    out['eo:(c+e)+o']=((c+e).astype(f32)+o).astype(f32)
    out['eo:c+(e+o)']=(c+(e+o).astype(f32)).astype(f32)
    out['eo:(c+o)+e']=((c+o).astype(f32)+e).astype(f32)
    # exact sum rounded once
    out['exact1']=(c.astype(np.float64)+P.sum(-1)).astype(f32)
    # pairs summed exactly, chain
    acc=c.copy()
    for k in range(0,K,2): acc=(acc.astype(np.float64)+P[...,k]+P[...,k+1]).astype(f32)
    out['pairfused']=acc
    acc=c.copy()
    for k in range(0,K,2): acc=(acc+(P[...,k]+P[...,k+1]).astype(f32)).astype(f32)
    out['pair']=acc
    # per-instruction: sum of all products in tile exact, then added
    out['tilesum_exact_then_add']=(c+P.sum(-1).astype(f32)).astype(f32)
    return out
torch.manual_seed(0)
for K in (2,4,8,32):
    tot={}
    for trial in range(50):
        a=(torch.randn(16,K)*torch.exp2(torch.randint(-6,6,(16,K)).float())).bfloat16()
        b=(torch.randn(K,16)*torch.exp2(torch.randint(-6,6,(K,16)).float())).bfloat16()
        c=(np.random.randn(16,16)*2.0**np.random.randint(-6,6,(16,16))).astype(f32)
        if trial%2: c[:]=0
        r=amx(a,b,c)
        for k,v in models(a,b,c).items():
            tot[k]=tot.get(k,0)+int((v.view(np.int32)!=r.view(np.int32)).sum())
    print(K, tot)

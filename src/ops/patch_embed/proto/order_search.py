"""Which K layout and instruction chunking reproduce the bf16 brgconv (AMX)? Emulates TDPBF16PS
(amxemu.py, semantics from amxmodel.py) on every output where F.linear and the conv differ plus 3000
random ones. Only "ic4 per-position chunk" (one instruction per kernel position, K = ic0,ic1,ic2,0)
gives 0 mismatches."""
import torch, torch.nn.functional as F, numpy as np, sys
from amxemu import amx_dot, chunks_of
torch.set_num_threads(1)
P=1024; dt=torch.bfloat16
rng=np.random.default_rng(0)
w=torch.from_numpy(rng.random((1280,3,2,14,14),dtype=np.float32)*0.0692-0.0346).to(dt)
x=torch.from_numpy(rng.standard_normal((P,3,2,14,14),dtype=np.float32)).to(dt)
y=F.conv3d(x,w,stride=(2,14,14)).view(P,1280)
lin=F.linear(x.reshape(P,-1), w.reshape(1280,-1))
d=(y!=lin).nonzero()
ri=torch.randint(0,P,(3000,)); rj=torch.randint(0,1280,(3000,))
idx=torch.cat([d, torch.stack([ri,rj],1)]); I,J=idx[:,0],idx[:,1]
def test(name, X, W, chunks, ref):
    e=torch.from_numpy(amx_dot(X[I],W[J],chunks)).to(dt)
    print(f"{name:40s} mism {(e!=ref[I,J]).sum().item()} / {len(I)}")
Xn=x.reshape(P,-1); Wn=w.reshape(1280,-1)
test("linear natural chunks16", Xn, Wn, chunks_of(588), lin)
test("conv natural chunks16", Xn, Wn, chunks_of(588), y)
xr=x.permute(0,2,3,4,1).reshape(P,28,42); wr=w.permute(0,2,3,4,1).reshape(1280,28,42)
for padto in (42,44,48,64):
    X=F.pad(xr,(0,padto-42)).reshape(P,-1); W=F.pad(wr,(0,padto-42)).reshape(1280,-1)
    test(f"conv rows pad{padto} chunk per row", X, W, chunks_of(padto//2)*28, y)
    test(f"conv rows pad{padto} chunks16 global", X, W, chunks_of(28*padto//2), y)
for icp in (3,4):
    X=F.pad(x.permute(0,2,3,4,1),(0,icp-3)).reshape(P,-1); W=F.pad(w.permute(0,2,3,4,1),(0,icp-3)).reshape(1280,-1)
    npairs=X.shape[1]//2 if X.shape[1]%2==0 else None
    if npairs: 
        test(f"conv ic{icp} per-position chunk", X, W, [icp//2]*(392) if icp==4 else chunks_of(npairs), y)
        test(f"conv ic{icp} chunks16 global", X, W, chunks_of(npairs), y)

#!/usr/bin/env python3
"""Upper bound on Nexus (Algorithm 1, squishy bin packing as published) for equal-rate model pairs on 2 GPUs.

Usage: scripts/nexus_algorithm1_bound.py [--zoo a100|1080ti] [--slo MS] A,B [C,D ...]
(default: the A100 zoo at each model's Table 4 SLO; --slo gives every model that SLO, as the goodput
grid's cells do). Prints 2x the highest equal rate that fits.
Mean rates, fractional batches, GPUs loaded to 100%: generous. See docs/benchmarks.md (Nexus on 2 GPUs).
"""
import argparse
import math
import os
ap=argparse.ArgumentParser()
ap.add_argument('--zoo',choices=['a100','1080ti'],default='a100')
ap.add_argument('--slo',type=float,default=None)
ap.add_argument('pairs',nargs='+')
args=ap.parse_args()
Z={}
for line in open(os.path.join(os.path.dirname(__file__), '..', 'scheduler', 'data', f'zoo-{args.zoo}.csv')):
    if line.startswith('#') or not line.strip() or 'alpha' in line: continue
    n,a,b,s=line.strip().split(',')[:4]; Z[n]=(float(a),float(b),args.slo if args.slo else float(s))
def l(m,b): a,be,_=Z[m]; return a*b+be
def gpus(ms,R):
    """Nexus Algorithm 1 with mean rates (no headroom, no bursts); fractional batches allowed (generous)."""
    total=0; nodes=[]
    for m in ms:
        a,be,L=Z[m]
        B=math.floor((L/2-be)/a)
        if B<1: return None  # Nexus cannot plan this model at all
        T=B/l(m,B)*1000; n=math.floor(R/T); total+=n; r=R-n*T
        if r<=1e-9: continue
        # residual: largest b with b/r + l(b) <= L (real b >= 1)
        bb=math.floor((L-be)/(1000/r+a))
        if bb<1: total+=1; continue
        d=bb/r*1000; occ=l(m,bb)/d
        if occ>1: total+=1; continue
        nodes.append((occ,d,[(m,r)]))
    nodes.sort(key=lambda x:-x[0]); merged=[]
    for occ,d,res in nodes:
        best=None
        for i,(o2,d2,res2) in enumerate(merged):
            dd=min(d,d2); allr=res+res2
            used=sum(l(m,max(dd*r/1000,1)) for m,r in allr)
            if used<=dd and all(dd+l(m,max(dd*r/1000,1))<=Z[m][2] for m,r in allr):
                o=used/dd
                if best is None or o>best[0]: best=(o,i,dd,allr)
        if best: merged[best[1]]=(best[0],best[2],best[3])
        else: merged.append((occ,d,res))
    return total+len(merged)
for pair in args.pairs:
    ms=pair.split(',')
    lo,hi=0.0,20000.0
    if gpus(ms,1e-3) is None: print(pair,'unplannable'); continue
    for _ in range(60):
        mid=(lo+hi)/2
        g=gpus(ms,mid)
        if g is not None and g<=2: lo=mid
        else: hi=mid
    print(pair, round(2*lo))

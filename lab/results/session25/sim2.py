import json, collections, itertools, random
L=json.load(open('/tmp/oracle/log.json'))
V=[1,1.18,1.41,1.64,1.97,2.30,2.63,2.96,3.33]
while len(V)<17: V.append(V[-1]+0.37)
C=0.012
BUCKETS=(1,2,3,4,6,10,16)
def bi(m):
    for i,b in enumerate(BUCKETS):
        if m<=b: return i
    return len(BUCKETS)
prompts=[]; 
for e in L:
    if 'P' in e: prompts.append([])
    else: prompts[-1].append(e)
prompts=prompts[1:]
def prep(e):
    if e.get('empty'): return None
    toks=e['toks']; par=e['parents'] or [i-1 for i in range(len(toks))]
    # depths
    dep=[]
    for p in par: dep.append(1 if p<0 else dep[p]+1)
    # accepted path node indexes
    path=[]; cur=-1
    # recompute via acc: follow children matching... we need tokens of answer; reuse: choose path greedily by acc count
    e['dep']=dep; e['par']=par
    return e
def realized(e, n, path):
    r=0
    for idx in path:
        if idx<n: r+=1
        else: break
    return r
# compute path using answers
def paths():
    g=None
    for e in L:
        if 'P' in e: g=e; continue
        if e.get('empty'): continue
        prep(e)
        j=e['pos']-g['plen']; i=g['plen']+j-1
        e['pend']=g['p1'][i-1]; e['pend2']=g['p1'][i-2] if i>=2 else 1.0
        nxt=g['P'][e['pos']-g['plen']:]
        cur=-1; path=[]
        while len(path)<len(nxt):
            hit=[i for i,p in enumerate(e['par']) if p==cur and e['toks'][i]==nxt[len(path)]]
            if not hit: break
            cur=hit[0]; path.append(cur)
        e['path']=path
paths()
def plan(e, q, margin=1.0, extra=0.1):
    best_n, best_s, E = 0, margin, 1.0
    chain=True
    for n,(f,p,d) in enumerate(zip(e['freqs'],e['par'],e['dep']),start=1):
        E+=f*q**d
        chain=chain and p==n-2
        s=E/(C+(0 if chain else extra)+V[n])
        if s>best_s: best_n,best_s=n,s
    return best_n
def evaluate(steps, qfun, margin=1.0):
    tok=cost=0
    for e in steps:
        if e.get('empty'): tok+=1; cost+=1; continue
        n=plan(e, qfun(e), margin)
        if n==0: tok+=1; cost+=1+C*0.5; continue
        chain=all(p==i-1 for i,p in enumerate(e['par'][:n]))
        r=realized(e,n,e['path'])
        tok+=r+1; cost+=C+(0 if chain else 0.1)+V[n]
    return tok/cost
def oracle(steps):
    tok=cost=0
    for e in steps:
        a=0 if e.get('empty') else len(e['path'])
        tok+=a+1; cost+=V[a]+(C if a else 0)
    return tok/cost
allsteps=[e for p in prompts for e in p]
PRIOR=(0.4,0.6,0.7,0.7,0.8,0.9,0.95,0.99)
print('oracle', round(oracle(allsteps),3))
print('prior q', round(evaluate(allsteps, lambda e: PRIOR[bi(e['m'])]),3))
# fit q per (bucket, stored) by coordinate search on train, eval on test; 2-fold by prompt
def fit(steps, keyf, grid=[x/20 for x in range(2,20)]+[0.99]):
    keys=sorted(set(keyf(e) for e in steps if not e.get('empty')))
    q={k:0.7 for k in keys}
    for it in range(3):
        for k in keys:
            best=max(grid, key=lambda g: evaluate([e for e in steps if not e.get('empty') and keyf(e)==k], lambda e: g))
            q[k]=best
    return q
random.seed(0)
def cb(x): return 0 if x<0.4 else (1 if x<0.8 else 2)
for keyname,keyf in [('bucket,stored,pend3',lambda e:(bi(e['m']),e['stored'],cb(e['pend']))),
                     ('bucket,pend3',lambda e:(min(bi(e['m']),6),cb(e['pend']))),
                     ('bucket,stored,pendmin',lambda e:(bi(e['m']),e['stored'],cb(min(e['pend'],e['pend2'])))),('bucket,stored',lambda e:(bi(e['m']),e['stored'])),
                     ('bucket,stored,nbin',lambda e:(bi(e['m']),e['stored'], 0 if e['n']==1 else (1 if e['n']<=3 else 2)))]:
    res=[]
    for fold in range(2):
        idx=list(range(len(prompts)))
        tr=[e for i in idx if i%2!=fold for e in prompts[i]]; te=[e for i in idx if i%2==fold for e in prompts[i]]
        q=fit(tr,keyf)
        res.append((evaluate(te, lambda e: q.get(keyf(e),0.5)), evaluate(te, lambda e: PRIOR[bi(e['m'])]), oracle(te)))
    print(keyname, [tuple(round(x,3) for x in r) for r in res])
    qall=fit(allsteps,keyf); print(' fit on all', round(evaluate(allsteps, lambda e: qall.get(keyf(e),0.5)),3), qall)

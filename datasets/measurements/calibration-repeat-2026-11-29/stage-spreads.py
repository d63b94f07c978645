import sys, time, json, warnings
if __name__ == "__main__":
    import distlab as dl
    sizes = json.loads(sys.argv[1])
    lab = dl.Lab(workers=2)
    try:
        for i in range(int(sys.argv[2])):
            t0 = time.time()
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                cm = lab.calibrate(sizes=sizes, cache=False, progress=False)
            rep = cm.fingerprint.get("repeatability") or []
            print(f"sizes {sizes} run {i}: {time.time()-t0:.1f} s; disturbed {cm.fingerprint.get('disturbed')}; "
                  f"unrepeatable {bool(cm.fingerprint.get('unrepeatable'))}")
            for s in rep:
                print("   ", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in s.items() if k in ('stage', 'spread', 'worst', 'figures')})
            for x in w:
                print("   warn:", str(x.message)[:200])
    finally:
        lab.close()

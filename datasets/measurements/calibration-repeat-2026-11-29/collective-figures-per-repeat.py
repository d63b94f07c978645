import time, warnings
if __name__ == "__main__":
    import distlab as dl
    import distlab.calibration.measure as M
    orig = M.stage_spread
    def dump(stage, figures):
        print("==", stage, {k: [round(x*1e3, 2) for x in v] for k, v in figures.items() if k != "compute slowdown"}, flush=True)
        return orig(stage, figures)
    M.stage_spread = dump
    lab = dl.Lab(workers=2)
    try:
        for i in range(3):
            t0 = time.time()
            M.measure_links(lab.cluster, repeats=5)
            print("seconds", round(time.time() - t0, 1))
    finally:
        lab.close()

"""The launch tier, the bottom of the harness's process rooms: what a trial is to a launcher
(`trials`), the subprocess trial pool (`pool`) and child processes that never outlive their
parent (`processes`).

The experiment plans trials and the executors start them; both import this tier, and it imports
neither (nor the trial tier), so the arrows point one way: experiment -> executors -> launch.
"""
